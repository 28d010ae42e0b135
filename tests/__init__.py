# Every process that runs the CPU suite's kernels imports this package first (pytest, and the
# spawned ranks that unpickle a test module's function), so the interpreter's shortcuts are in
# place before any kernel runs (tests/interpreter.py says why).
from tests.interpreter import patch_builtins_once, use_numpy_xor_sum

use_numpy_xor_sum()
patch_builtins_once()
