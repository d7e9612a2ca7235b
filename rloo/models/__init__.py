"""What a model is and how it loads: loading, LoRA, FSDP2 sharding, MLP recomputation and packaged weights;
the families' layer code is rloo.families."""
