"""Search a video collection: query parsing, first stages, the frame store, DiCoSA rerank."""
