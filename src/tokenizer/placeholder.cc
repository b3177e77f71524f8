// Placeholder until the tokenizer lands; remove when src/tokenizer has real sources.
