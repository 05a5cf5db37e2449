"""The web console (``pgtaskd web``): a process of its own that shows the queue and, when
allowed, acts on it through the client.

``app`` builds the Starlette application (pages, actions, sessions), ``server`` runs it on
uvicorn within bounds, ``passwords`` hashes and checks the config's passwords. Nothing here
is imported by a daemon: the console's libraries are the ``web`` extra.
"""
