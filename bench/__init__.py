"""`make bench`: Canopy's speed and memory figures beside their ceilings (issue 6).

Each measurement starts real server processes (daphne) on free loopback ports with a fresh
database, drives them over real WebSockets and HTTP, and writes one flat ``bench.json``.
"""
