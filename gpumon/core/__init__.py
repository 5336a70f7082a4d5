"""Plain values and the habits every stage shares: the samples passed up the chain (`model`),
time (`clock`), user-facing errors and exit codes (`errors`), failures logged once per cause
(`problems`) and calls that may never return (`guard`). Imports nothing else of gpumon."""
