"""What the command prints about a run, apart from the commands themselves: `summary` (the run's text, where the
emails went), `failures` (a run's failed steps and checks, the last-failure file, the recovery report) and
`progress_bar` (the send's progress on stderr, only when asked). Imported by the command groups of `pipelines.cli`
inside the function that prints; imports nothing of them."""
