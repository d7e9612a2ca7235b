"""The episode service: rows in, scored and version-stamped `Rollout`s out. Below the algorithms and held-out
evaluation, above the rollout engine (rloo.generation), the environments and the rewards.

    episodes.py   EpisodeService: environments started, observations appended, episodes sampled, environments
                  closed, the reference's log-probs, the reward model's and reward functions' scores (one place)
    producer.py   the same service in a process of its own, beside the learner (max_staleness > 0)
    weights.py    the policy versions the learner publishes to it, in shared memory
    staleness.py  which version samples which rollout (exact lag, bounded), and the checks on every record

The synchronous loop is the service called inline; the asynchronous one is the same service in a producer process.
"""
