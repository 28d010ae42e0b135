"""The stretches of dec05_f/call2_counters.txt named by the source lines of the profiled scan's
machine code. Usage (repository root): PYTHONPATH=. python3 benchmarks/results/dec05_g/by_code.py
KERNEL.cubin"""
import collections
import sys

from benchmarks.stall_summary import source_lines

# (first, last instruction), % of stall samples, % of executed instructions: call2_counters.txt
STRETCHES = {
    "logprobs_20:256 (79.4 us, 9700 samples)": [
        ((0, 82), 10.1, 5.3), ((2887, 2891), .1, .3), ((4658, 5169), 27.5, 32.7),
        ((5559, 6098), 30.6, 31.4), ((6491, 6544), 2.5, 3.1), ((8013, 8045), .9, 2.1),
        ((10214, 10265), 3.8, 3.2), ((10668, 10863), 8.1, 8.8), ((11250, 11311), 1.9, 2.6),
        ((11979, 12054), 2.1, 4.7), ((12984, 13087), .1, .1), ((13113, 13238), 12.1, 5.5)],
    "greedy:256 (62.2 us, 7428 samples)": [
        ((0, 82), 15.8, 9.7), ((2887, 2891), .2, .6), ((4658, 4662), .5, .6),
        ((6545, 6547), .5, .3), ((7283, 8045), 80.7, 84.6), ((10214, 10236), 1.0, 2.7),
        ((13222, 13238), 1.0, 1.5)],
}

where = source_lines(sys.argv[1])
print(f"machine code: {len(where)} instructions")
for point, stretches in STRETCHES.items():
    print(point)
    for (a, b), samples, executed in stretches:
        top = collections.Counter(where[a:b + 1]).most_common(4)
        print(f"  [{a:5d}, {b:5d}] samples {samples:5.1f}%  instructions {executed:5.1f}%  "
              + ", ".join(f"{x} ({n})" for x, n in top))
