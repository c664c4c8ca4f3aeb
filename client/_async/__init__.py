"""The async-first client classes (the sync twins wrap these)."""
