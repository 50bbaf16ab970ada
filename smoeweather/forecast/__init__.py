"""smoeweather.forecast"""
