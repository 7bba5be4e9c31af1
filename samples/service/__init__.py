"""A sample training service: start, watch, cancel and resume training runs over HTTP.

``python -m samples.service`` serves it with uvicorn; see ``samples/service/app.py`` for
the routes, ``samples/service/runs.py`` for how runs are kept and
``samples/service/training.py`` for what a run does.
"""
