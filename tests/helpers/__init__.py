"""Helpers shared by the test layers: fakes, the live server, the browser, SSE reading."""
