"""The ONNX conformance cases uopc does not pass yet, each with its reason (strict: a pass fails the suite)."""

XFAIL: dict[str, str] = {}
_BY_CAUSE: dict[str, list[str]] = {
    # operators not implemented
    "not implemented: ImageDecoder (needs an image codec)": [
        "test_image_decoder_decode_jpeg_rgb",
        "test_image_decoder_decode_jpeg_grayscale",
        "test_image_decoder_decode_jpeg_bgr",
        "test_image_decoder_decode_jpeg2k_rgb",
        "test_image_decoder_decode_bmp_rgb",
        "test_image_decoder_decode_png_rgb",
        "test_image_decoder_decode_tiff_rgb",
        "test_image_decoder_decode_webp_rgb",
        "test_image_decoder_decode_pnm_rgb",
    ],
    "not implemented: MelWeightMatrix": ["test_melweightmatrix"],
    # random numbers: onnx's expected values come from NumPy's generator, which uopc's Philox does not reproduce
    "random: uopc's Philox stream draws other numbers than onnx's NumPy-made expectations (Bernoulli, Dropout)": [
        "test_bernoulli",
        "test_bernoulli_expanded",
        "test_bernoulli_double",
        "test_bernoulli_double_expanded",
        "test_bernoulli_seed",
        "test_bernoulli_seed_expanded",
        "test_training_dropout_default",
        "test_training_dropout_default_mask",
        "test_training_dropout",
        "test_training_dropout_mask",
    ],
    # numerics
    "numerics: float16 attention rounds intermediates differently (2 of 192 values one fp16 ulp off)": [
        "test_attention_4d_causal_fp16",
        "test_attention_4d_causal_fp16_expanded",
    ],
    "numerics: the expected values carry NumPy's float32 FFT round-off (1.9e-7 where the exact value is 0)": [
        "test_dft_inverse_opset19",
        "test_dft_inverse",
    ],
}
for _cause, _names in _BY_CAUSE.items():
    for _n in _names:
        XFAIL[_n] = _cause
