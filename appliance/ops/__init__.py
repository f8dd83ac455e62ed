"""Running the appliance: wiring and serving, systemd notification, tuning a machine."""
