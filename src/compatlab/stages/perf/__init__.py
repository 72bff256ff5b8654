"""The perf stage: EAGLE-3 against its non-speculative baseline on the cell's own SGLang."""
