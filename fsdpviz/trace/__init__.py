"""Kineto trace JSON -> tidy tables (see ``schema``). Never imports torch or plotting."""
