"""Invoke task modules, one per area. Each task is thin: parse, call one library function, print, record."""
