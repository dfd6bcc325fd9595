"""The Trio actors that run the engine: engine actor, tokenizer and metrics.

Everything here is engine-side: it imports neither HTTP nor the server, and reports why a
request ended as types (actors.errors, actors.runtime.failures), never as statuses.
`system.run_actor_system` composes them; a front end submits RequestStates through the
handle it returns and reads their Outboxes.
"""
