"""Weight-only quantization of a loaded model (`quantize`: INT8 / INT4, GPTQ) and its calibration set
(`calibration`)."""
