"""ONNX Runtime, Python side: session options with an opsmith op library, provider checks, doctor rows."""
