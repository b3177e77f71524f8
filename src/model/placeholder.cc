// Placeholder until the engine lands; remove when src/model has real sources.
