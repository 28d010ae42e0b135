"""`benchmarks.profile_kernels --check` refuses, without a GPU, the arguments a device call
would only refuse after its kernels compiled."""

import pytest

from benchmarks import profile_kernels


def test_check_accepts_good_arguments():
    profile_kernels.main(["--modes", "greedy,logprobs_20", "--dtype", "bfloat16",
                          "--batches", "1,256", "--check"])


@pytest.mark.parametrize("args", [["--dtype", "bf16"], ["--modes", "greedy,logprob_20"],
                                  ["--batches", "1,x"]])
def test_check_refuses_a_typo(args):
    with pytest.raises(SystemExit) as exc:
        profile_kernels.main([*args, "--check"])
    assert exc.value.code == 2
