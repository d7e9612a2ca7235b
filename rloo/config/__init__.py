"""What a valid config is: the schema of every key (`schema`) and the checks that span keys (`checks`), run
before any model loads; neither imports Lightning or torch."""
