"""Planning and checking: a request through the memory model, the CP-SAT model and the start-up
model to a Plan; fixes for a request with none; `check` of an existing stage config."""
