"""The search service and its web page (``dicosa serve``; extra ``dicosa[serve]``).

``engine`` adapts an opened index for the service (search, "more like this", the moment,
media files); ``app`` holds the FastAPI routes; ``media`` streams files with byte ranges and
makes thumbnails; ``security`` checks the API key; ``static/`` is the page. Nothing here is
imported by the rest of dicosa, and FastAPI is imported only by ``app`` and ``media``.
"""
