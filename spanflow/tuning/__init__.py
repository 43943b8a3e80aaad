"""Measured choices: sweeps of token budget and max length, profiles, and the doctor."""
