"""hitoban.training"""
