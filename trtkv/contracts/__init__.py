"""Foundation layer: what stages, servers and clients agree on: the stage contract (trtkv.contracts.stage: manifest,
up-to-date skip, atomic output), the typed files stages hand each other (artifacts), the request interface of a served
model (interface) and the one-token canary request built from it (canary)."""
