"""Foundation layer: user-facing errors, project paths, the stage contract, processes and their sessions, external tools,
progress, the API key and the shipped texts. Imports nothing else of trtkv."""
