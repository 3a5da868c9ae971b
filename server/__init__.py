"""The server's policy, shared by the page (ui/) and the API (api/) it serves beside it: what one
visitor may cost (limits, admission to the queue), what a visitor can reach (the route guard),
each session's state and running job (sessions, the run registry), and the logins."""
