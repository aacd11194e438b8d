"""Video data layer: decoding, dataset annotations, PyTorch datasets, synthetic benchmark."""

from .datasets import (
    DATASETS,
    VIDEO_EXTENSIONS,
    AnnotationError,
    DatasetInfo,
    RetrievalSplit,
    load_split,
    split_off_validation,
)
from .loader import BadVideosError, TextDataset, TrainDataset, VideoDataset
from .synthetic import make_synthetic
from .video import (
    VideoDecodeError,
    check_video,
    check_videos,
    load_video,
    sample_indices,
    video_info,
)

__all__ = [
    "DATASETS",
    "VIDEO_EXTENSIONS",
    "AnnotationError",
    "BadVideosError",
    "DatasetInfo",
    "RetrievalSplit",
    "TextDataset",
    "TrainDataset",
    "VideoDataset",
    "VideoDecodeError",
    "check_video",
    "check_videos",
    "load_split",
    "load_video",
    "make_synthetic",
    "sample_indices",
    "split_off_validation",
    "video_info",
]
