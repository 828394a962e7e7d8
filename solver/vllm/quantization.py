"""How vLLM lays out quantized weights: the scale overhead it stores beside them and the padding
its MoE kernels apply, as named constants with their sources (read by inputs/quantization.py)."""

# Per-tensor and per-channel scales: one fp32 per tensor or per output row, below 4 / 1024 bytes
# per weight for any layer at least 1024 wide (estimate, high).
QUANT_SCALE_BYTES_PER_WEIGHT = 4 / 1024

# vllm 0.11.0 model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights: per backend,
# (hidden, intermediate per partition) round-up. MARLIN: "n % 256 == 0 and k % 128 == 0" -> intermediate
# 128, hidden 256; SM100 FlashInfer TRTLLM/BF16 and ROCm: 256, 256; SM100 FlashInfer CUTLASS and SM90
# FlashInfer BF16: 128, 128; TRITON (CUDA): intermediate 64, hidden as is.
MXFP4_PADDING = {"marlin": (256, 128), "triton": (1, 64), "sm90_fi_mxfp4_bf16": (128, 128),
                 "sm100_fi_mxfp4_mxfp8_cutlass": (128, 128), "sm100_fi_mxfp4_mxfp8_trtllm": (256, 256),
                 "sm100_fi_mxfp4_bf16": (256, 256), "rocm": (256, 256)}
# The backend unknown: the largest round-up of any backend in each dimension (errs high).
MXFP4_PADDING_UNKNOWN = (256, 256)

# `quantization` values vLLM accepts beside a checkpoint's own method: its Marlin kernel, which
# override_quantization_method returns for GPTQ and AWQ (vllm 0.30.0 config/model.py
# _verify_quantization; quantization/gptq_marlin.py, awq_marlin.py / auto_awq.py).
QUANT_OVERRIDES = {"gptq": ("gptq_marlin",), "awq": ("awq_marlin",)}

# fp8 at load (`quantization=fp8` on an unquantized checkpoint) creates each layer's weight on
# the meta device and quantizes it as it loads from vLLM 0.16 (quantization/fp8.py
# patched_weight_loader in the 0.16.0 wheel; the 0.14.1 wheel allocates every bf16 weight first,
# so the whole bf16 model must fit at load): before that it is refused, not modelled.
FP8_AT_LOAD_STREAMED_FROM = (0, 16)
