"""The gunicorn worker class for the production server: uvicorn's, without the ASGI lifespan protocol
(Django does not implement it; uvicorn would log that it "appears unsupported" at every start)."""

from uvicorn_worker import UvicornWorker


class CardhourUvicornWorker(UvicornWorker):
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "lifespan": "off"}
