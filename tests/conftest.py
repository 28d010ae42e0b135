# Importing graphshard sets TRITON_INTERPRET=1 on machines without CUDA (before any kernel module
# loads; see graphshard/__init__.py), and child processes inherit it.
import graphshard  # noqa: F401


def pytest_collection_modifyitems(items):
    """The sm_90 compile test (minutes of ptxas, no interpreter) goes first: with several workers
    (`make test` runs two) it then overlaps the interpreted tests instead of running alone at
    the end."""
    items.sort(key=lambda item: item.path.name != "test_compile_sm90.py")
