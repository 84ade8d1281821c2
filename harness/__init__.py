"""Policy profiles, their versions, the settings schema, the layered compiler and the tool planner."""
