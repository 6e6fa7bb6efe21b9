"""Declaring teams: roles, shared-context state, turn-taking router, the compiled LangGraph."""
