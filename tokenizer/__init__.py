"""Subword tokenizers: joint BPE/Unigram vocabularies trained here, or a pretrained Marian tokenizer."""

from .base import Tokenizer, TokenizerError
from .factory import build_tokenizer, load_tokenizer, train_tokenizer
from .joint import JointSubwordTokenizer
from .marian import MarianTokenizerWrapper

__all__ = [
    "JointSubwordTokenizer",
    "MarianTokenizerWrapper",
    "Tokenizer",
    "TokenizerError",
    "build_tokenizer",
    "load_tokenizer",
    "train_tokenizer",
]
