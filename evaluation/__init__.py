"""hitoban.evaluation"""
