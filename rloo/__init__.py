"""rloo: RLOO and the REINFORCE family for online RLHF and RL with verifiable rewards.

`python -m rloo.train` is the command line; `rloo.fit(...)` the same run from Python (rloo.front_door)."""


def __getattr__(name: str):
    if name == "fit":  # imported on use: `import rloo` stays light
        from rloo.front_door import fit

        return fit
    raise AttributeError(f"module 'rloo' has no attribute {name!r}")
