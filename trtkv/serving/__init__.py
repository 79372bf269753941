"""`trtkv serve`, `stop`, `status` and `generate`: starting a recipe's server (serve, container), supervising it
(supervise, health; the canary request is trtkv.contracts.canary), ending it completely (teardown), and generating
without a server (generate)."""
