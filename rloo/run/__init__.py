"""A run from a composed config: the pipeline (prepare, build, fit, finish), the command line around Hydra, the
module's assembly, callbacks, resolvers, loggers, the model card and the memory plan."""
