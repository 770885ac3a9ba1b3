"""Model FLOPs utilisation: the work per image, and the device's peak.

A text model's FLOPs per example (a sequence) are counted, not measured:
6 N + 12 L H Q T per token (trainscale.core.gpt). An image model's FLOPs
per image are counted from the model's own graph (TensorFlow's
profiler over the frozen forward pass at batch 1, a multiply-add counted as
2 FLOPs), so every model and image size gets its number the same way. A
training step costs about 3x the forward pass (the backward pass computes
gradients for both activations and weights, each about one forward pass):
the usual convention for MFU, which leaves out optimizer updates and input
preparation.

Peaks are dense (no structured sparsity) tensor-core or vector rates from the
vendors' data sheets, per GPU, by the arithmetic that ran: `fp32` (the vector
units), `tf32` (float32 on tensor cores, Ampere and later), `fp16`, `bf16`. A
float32 run is compared with the TF32 peak where its backend ran TF32
(Backend.peak_precision): TensorFlow does by default; torch does for cuDNN's
convolutions but not for matmuls (torch.backends.cudnn.allow_tf32 and
torch.backends.cuda.matmul.allow_tf32).
"""

from __future__ import annotations

TRAINING_OVER_FORWARD = 3

# TFLOP/s per GPU (SXM parts, dense), by the arithmetic a run's steps ran.
PEAK_TFLOPS = {
    "V100": {"fp32": 15.7, "fp16": 125.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H200": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
}
PEAK_BASIS = {
    "V100": "V100 SXM2 data sheet: FP32 vector / FP16 tensor cores",
    "A100": "A100 SXM data sheet: FP32 vector / TF32, FP16, BF16 tensor cores, dense",
    "H100": "H100 SXM data sheet: FP32 vector / TF32, FP16, BF16 tensor cores, dense",
    "H200": "H200 SXM data sheet: FP32 vector / TF32, FP16, BF16 tensor cores, dense",
}


def gpu_model(device_name: str | None) -> str | None:
    """The peak table's key for a device name such as 'NVIDIA H100 80GB HBM3'."""
    for key in PEAK_TFLOPS:
        if device_name and key in device_name.upper():
            return key
    return None


def peak_tflops(device_name: str | None, precision: str) -> float | None:
    """Peak TFLOP/s of one such device for `precision`'s arithmetic (fp32, tf32,
    fp16, bf16), or None if unknown."""
    key = gpu_model(device_name)
    if key is None:
        return None
    peaks = PEAK_TFLOPS[key]
    # TF32 allowed on a GPU without it (Volta) runs float32 on the vector units.
    return peaks.get("tf32", peaks["fp32"]) if precision == "tf32" else peaks.get(precision)


def text_training_flops_per_example(settings) -> int:
    """A text model's training FLOPs per example (a sequence): its tokens
    times trainscale.core.gpt's count per token, the same in both ecosystems."""
    from trainscale.core.gpt import training_flops_per_token

    per_token = training_flops_per_token(settings.model, settings.seq_len, settings.vocab_size)
    return settings.seq_len * per_token


def utilisation(
    images_per_sec: float | None,
    flops_per_image: int,
    devices: int,
    device_name: str | None,
    precision: str,
) -> dict:
    """Achieved TFLOP/s and MFU of a run over `devices` devices (None where
    unknown), against the peak of `precision`, the arithmetic its steps ran
    (Backend.peak_precision: tf32 for a float32 run on tensor cores)."""
    achieved = images_per_sec * flops_per_image / 1e12 if images_per_sec else None
    peak = peak_tflops(device_name, precision)
    key = gpu_model(device_name)
    return {
        "training_flops_per_image": flops_per_image,
        "achieved_tflops": achieved,
        "peak_tflops_per_device": peak,
        "peak_precision": precision,
        "peak_basis": PEAK_BASIS[key] if key else "unknown: device not in the peak table",
        "mfu": achieved / (peak * devices) if achieved and peak else None,
    }
