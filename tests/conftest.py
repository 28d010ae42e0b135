# Importing graphshard sets TRITON_INTERPRET=1 on machines without CUDA (before any kernel module
# loads; see graphshard/__init__.py), and child processes inherit it.
import graphshard  # noqa: F401
