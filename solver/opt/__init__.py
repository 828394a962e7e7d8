"""The optimisation: the planning problem as plain numbers, its CP-SAT model and objective
phases, the solver loop, infeasibility explanations and the brute-force test oracle."""
