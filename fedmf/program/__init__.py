"""fedmf layer 4, programs: the training loop behind `fedmf simulate` and `fedmf train`.

One loop, two ways to run it: in process for a simulation, or as a resumable `tff.program`-style
program with checkpoints, releases and a privacy-budget guard. See docs/simulation.md.
"""
