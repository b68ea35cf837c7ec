"""Small texts that ship with hitoban (original, written for the project)."""
