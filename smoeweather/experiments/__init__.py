"""smoeweather.experiments"""
