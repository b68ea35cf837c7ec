"""hitoban.release"""
