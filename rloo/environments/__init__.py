"""Multi-turn environments (`env=`): a Python class the policy acts in, turn by turn, whose replies enter the episode
and whose rewards score it (rloo.environments.base)."""
