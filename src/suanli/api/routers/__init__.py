"""One router per area; each route parses, authorises through a service, and renders."""
