"""Policy profiles and versions, the settings schema, the layered compiler, the tool planner."""
