import os

# Triton kernels run under the interpreter on machines without a GPU; the variable must be set
# before triton is imported, and child processes inherit it.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
