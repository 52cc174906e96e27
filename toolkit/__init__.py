"""patchkit: apply, build and prove llama-server changes on real llama.cpp trees."""
__version__ = "0.1.0"
