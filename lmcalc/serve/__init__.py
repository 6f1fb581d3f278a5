"""The local page (``lmcalc serve``): questions read from the page's fields (``questions``), answered by the Python
API and laid out for the page (``answers``), over the standard library's HTTP server (``server``); the page itself,
HTML, CSS and JavaScript that compute no figure, is in ``page/``."""
