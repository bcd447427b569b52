"""The Canopy project: settings, URL root, ASGI entry point and the daphne launcher."""
