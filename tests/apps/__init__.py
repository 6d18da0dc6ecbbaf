"""Small apps that tests/test_process.py serves in real host processes."""
