"""What scores a completion: `reward=` (the reward model, functions, weighted sums) and user code."""
